// placeholder translation unit so the data layer library exists before its code lands

// placeholder translation unit so the observe layer library exists before its code lands

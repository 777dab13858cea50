// placeholder translation unit so the layers layer library exists before its code lands

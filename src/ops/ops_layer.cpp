// placeholder translation unit so the ops layer library exists before its code lands

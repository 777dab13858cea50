// placeholder translation unit so the train layer library exists before its code lands

// placeholder translation unit so the checkpoint layer library exists before its code lands

// placeholder translation unit so the config layer library exists before its code lands

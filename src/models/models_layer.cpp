// placeholder translation unit so the models layer library exists before its code lands

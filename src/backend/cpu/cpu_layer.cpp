// placeholder translation unit so the cpu layer library exists before its code lands

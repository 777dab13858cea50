// placeholder translation unit so the optim layer library exists before its code lands

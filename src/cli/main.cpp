// primus-cli entry point (wiring lands with the CLI).
int main() { return 0; }

// primus-cli, the one command of Primus. Parsing, dispatch and exit codes live in launcher.cpp; each command
// family in commands_<family>.cpp.
#include "cli/cli.h"

int main(int argc, char** argv) { return primus::cli::run_cli(argc, argv); }

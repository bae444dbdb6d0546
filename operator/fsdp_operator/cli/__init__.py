"""The command line: `fsdpctl` and its subcommands; argument parsing and output."""

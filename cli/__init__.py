"""The command line (`wb`): the top floor, above the experiments and validators it runs."""

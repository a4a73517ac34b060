"""``python -m resumequal`` (and ``torchrun -m resumequal``) runs the CLI."""

from resumequal.cli import main

main()

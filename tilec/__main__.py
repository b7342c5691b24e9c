"""`python -m tilec ...` is the `tilec` command."""
import sys

from tilec_cli import main

sys.exit(main())

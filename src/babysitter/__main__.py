"""``python -m babysitter`` runs the command line."""

import sys

from babysitter.cli import main

sys.exit(main())

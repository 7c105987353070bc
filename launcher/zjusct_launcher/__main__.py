"""``python -m zjusct_launcher`` entry point."""

import sys

from zjusct_launcher.cli import main

sys.exit(main())

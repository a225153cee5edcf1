"""`python -m hlofuse.report`: the hlofuse-report command."""

import sys

from hlofuse.report.cli import main

sys.exit(main())

"""``python -m fairstream``: the command line (``fairstream.cli``)."""

import sys

from fairstream.cli import main

sys.exit(main())

"""``python -m slide.cli`` is the ``slide`` command."""
import sys

from slide.cli.main import main


sys.exit(main())

"""``slide info``: what a run's speed depends on outside slide (``slide.environment``)."""
from __future__ import annotations

import json

from slide.cli.common import EXIT_OK


def cmd_info(args):
    # imported here: the CLI loads Numba only for the command that needs it
    from slide import environment
    info = environment.system_info()
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print("\n".join(environment.format_info(info)))
    return EXIT_OK

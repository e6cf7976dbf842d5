"""``python -m fairstream``: the command line (``fairstream.cli``)."""

import sys

try:
    from fairstream.cli import main
except ModuleNotFoundError as exc:  # run outside the environment ./scripts/demo.sh installs
    print(f"fairstream: error: {exc.name} is not installed for {sys.executable}: run ./scripts/demo.sh once (it "
          "installs everything into .venv), then use .venv/bin/fairstream or `source .venv/bin/activate`",
          file=sys.stderr)
    sys.exit(2)

sys.exit(main())

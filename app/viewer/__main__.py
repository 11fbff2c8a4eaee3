"""`python -m app.viewer [SCENE] ...`: the interactive window with viewer-only options (app.viewer.interactive)."""
import sys

from app.errors import UserError
from app.viewer.interactive import viewer_main

try:
    sys.exit(viewer_main())
except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(e.exit_code)

"""`python -m pcieprof.refserver [SGLang-style flags]`."""

import sys

from pcieprof.refserver.server import main

sys.exit(main())

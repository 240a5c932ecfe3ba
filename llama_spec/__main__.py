"""`python -m llama_spec` == the `llama-spec` command."""

import sys

from .cli import main

sys.exit(main())

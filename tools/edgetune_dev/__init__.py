"""edgetune_dev: the development harness of an edgetune checkout, apart from the product.

Device twins (twin/) and the VM twin (vm/), the benchmarks (bench*), the
packaging of the reference runtime and the LLM artifacts (artifacts, llm), the
host setup they need (host_packages, kernel_headers), the role READMEs'
generator and the checkout's scripts (scripts/: demo, test jobs, sanity, the
Python 3.8 run), all behind one command, `edgetune-dev` (edgetune_dev.cli).

It runs from a checkout only (an editable install, `make venv`): it works on
the checkout's own files, imports the collection's module utilities from the
checkout (its committed collections/ link) and the reference runtime from
runtime/, both put on the import path here. The product, the `edgetune` CLI
(cli/), never imports this package; this package uses the CLI's public parts.
"""
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
if not (CHECKOUT / "galaxy.yml").is_file():
    raise ImportError("edgetune_dev runs from an edgetune checkout (pip install -e tools), not from %s"
                      % CHECKOUT)
for path in (CHECKOUT / "collections", CHECKOUT / "runtime"):
    if str(path) not in sys.path:
        sys.path.append(str(path))

"""edgetune_dev: the development harness of an edgetune checkout, apart from the product CLI.

Device twins (twin/) and the VM twin (vm/), the benchmarks (bench*), the
packaging of the reference runtime and the LLM artifacts (artifacts, llm),
and the host setup they need (host_packages, kernel_headers). The wheel of
the `edgetune` CLI does not include it: `edgetune` adds its commands (twin,
vm, bench, runtime; see edgetune_dev.cli) where this package imports, which is
in a checkout (edgetune puts the checkout's tools/ on its path).
"""

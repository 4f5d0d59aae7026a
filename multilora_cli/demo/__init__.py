"""The bundled demo: a small trained Llama in Hugging Face layout plus three PEFT adapters (`multilora demo`).

Lives in the package (not examples/) so `multilora demo` works from an installed wheel. Importing
`multilora_cli.demo.build` imports torch; this package's own import does not.
"""

from __future__ import annotations


def build_demo(out, **kwargs) -> dict:
    """Build the demo into `out`; see `multilora_cli.demo.build.build_demo`."""
    from multilora_cli.demo.build import build_demo as _build

    return _build(out, **kwargs)

"""One module per report section; each exposes `build(view, ctx) -> Section | None`.

`None` means the bundle has nothing for the section; the builder then shows "not measured".
"""

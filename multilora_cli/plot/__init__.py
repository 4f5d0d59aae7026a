"""Pictures of the economics and bench reports: matplotlib figures (`--plot FILE`) and terminal sparklines.

The data drawn comes from the layers below, unchanged: `economics.curves` (whole reports over a tenant sweep)
and `bench.series` (the report's rows). matplotlib is imported only inside the drawing functions
(`target.require_matplotlib` says which extra installs it); `terminal` needs only rich.
"""

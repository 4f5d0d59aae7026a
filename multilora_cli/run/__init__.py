"""The `multilora run` job: one pass from JSONL in to JSONL out over one engine.

config.py (RunConfig, EngineFlags: what was asked) -> setup.py (pre-flight, the EngineConfig it implies) ->
job.py (RunJob: read, admit, write in order, stats) with ledger.py (--resume fingerprints) and outputs.py
(the output files around the engine's start). plan.py (EnginePlan) and engine_api.py (JobEngine) are the seam
to whichever engine runs the requests: engine.Engine in one process, distributed.DistributedEngine over several.
The choice between the two is made above this package (commands/run.py); nothing here imports distributed/.
"""

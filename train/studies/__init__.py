"""The paper's experiments at a small scale, each a command that runs `train.main` in child
processes (train.studies.child_runs) and writes a report:

    python -m train.studies.ablate --study=position_embedding --out=docs/ablations
    python -m train.studies.mpp --pretrain_workdir=runs/mpp --out=docs/mpp

`ablate` trains the arms of an ablation study (`ablations`: the studies as data, and their
reports); `mpp` measures what masked patch prediction gives.
"""

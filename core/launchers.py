"""Where launchers put a process's place in the job: the environment variables the rank
wrapper reads at start and the ingest reads back from an export's captured environment,
each list in order of preference: the launcher nearest the process first (torchrun, Open
MPI's mpirun, PMI/MPICH's mpiexec, then Slurm's srun), since an inner launcher's process
inherits the outer one's variables: under `mpirun` in a Slurm batch script every rank
carries the batch step's SLURM_PROCID=0 and SLURM_NTASKS=1.

Kept apart from the analysis so the rank wrapper starts without importing it."""

RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
LOCAL_RANK_ENV = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
WORLD_SIZE_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "SLURM_NPROCS")
JOB_ENV = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID")
# torchrun sets TORCHELASTIC_RUN_ID to "none" unless given --rdzv-id: the same for every job.
_NO_JOB = {"TORCHELASTIC_RUN_ID": "none"}


def job_id(env: dict[str, str], names: tuple[str, ...] = JOB_ENV) -> str | None:
    """The first job id the environment sets among ``names``, none that says no job."""
    return next((env[name] for name in names if env.get(name) and env[name] != _NO_JOB.get(name)), None)

# Commands that start a job's ranks as their own child processes (torch elastic's launcher,
# as a program or as a module).
RANK_STARTERS = ("torchrun",)
RANK_STARTER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def starts_ranks(cmd: list[str]) -> str | None:
    """The launcher ``cmd`` runs where it starts the job's ranks itself, else None."""
    if cmd and cmd[0].rsplit("/", 1)[-1] in RANK_STARTERS:
        return cmd[0].rsplit("/", 1)[-1]
    for flag, module in zip(cmd, cmd[1:]):
        if flag == "-m" and module in RANK_STARTER_MODULES:
            return f"python -m {module}"
    return None

"""KernelBench tasks: loaders (a checkout, the Hugging Face export, our built-in set), task identity and splits."""
from kevin_jax.tasks.kernelbench import (LoadedTasks, SkippedTask, Split, Task, TasksConfig, check_known_tasks,
                                         default_split, load_builtin_tasks, load_kernelbench_dir,
                                         load_kernelbench_parquet, load_split, load_tasks, resolve_split, save_split,
                                         select)
from kevin_jax.tasks.solutions import Solution, builtin_solutions

__all__ = ["LoadedTasks", "SkippedTask", "Split", "Task", "TasksConfig", "check_known_tasks", "default_split", "load_builtin_tasks",
           "load_kernelbench_dir", "load_kernelbench_parquet", "load_split", "load_tasks", "resolve_split",
           "save_split", "select", "Solution", "builtin_solutions"]

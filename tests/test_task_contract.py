"""A task a researcher writes (README "Add a task") fails the way a config does: `bash launch.sh` prints one line
naming the file and the row or line, exits 2, and no rank starts (rewards.get_task, rewards.load_split)."""
import os
import subprocess

import pytest
from conftest import ROOT

HEAD = 'DEFAULT_TRAIN = DEFAULT_TEST = "unused"\n\n\ndef reward(completion, answer):\n    return 0.0\n\n\n'
BAD_TASKS = {  # name: (the task file, what its one line says after the file's path)
    "rows_without_answer": (HEAD + 'def load(source, split):\n    return [{"prompt": f"{i} + 1 ="} for i in range(8)]\n',
                            ": load('unused', 'train')[0] needs a text 'prompt' and an 'answer' (rewards/__init__.py), "
                            "got keys 'prompt'"),
    "fewer_prompts_than_searchers": (HEAD + 'def load(source, split):\n    return [{"prompt": "1 + 1 =", "answer": '
                                            '"2"}]\n',
                                     ": load('unused', 'train'): 1 record(s) for n_searchers=2: each searcher walks "
                                     "its own shard of the train prompts, so every one needs a prompt at least"),
    "syntax_error": (HEAD + "def load(source, split)\n    return []\n", ":8: syntax error (expected ':')"),
    "raises_on_import": (HEAD + "import a_package_that_is_not_installed\n",
                         ":8: importing it raised ModuleNotFoundError: No module named "
                         "'a_package_that_is_not_installed'"),
}


@pytest.mark.parametrize("bad", BAD_TASKS)
def test_a_bad_task_is_one_line_and_exit_2_from_launch_before_any_rank_starts(tmp_path, bad):
    source, says = BAD_TASKS[bad]
    task, out = tmp_path / "mytask.py", tmp_path / "run"
    task.write_text(source)
    p = subprocess.run(["bash", "launch.sh", "configs/tiny.yaml", f"task={task}", f"out_dir={out}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    where = f"task {task}" if bad in ("rows_without_answer", "fewer_prompts_than_searchers") else str(task)
    assert (p.returncode, p.stdout, p.stderr) == (2, "", f"error: {where}{says}\n")
    assert not out.exists()  # --prepare stopped before it claimed out_dir: torchrun never ran

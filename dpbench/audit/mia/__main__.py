"""``python -m dpbench.audit.mia`` is the ``dpbench-mia`` command (the start folder is not
imported from: dpbench/utils/start_folder.py)."""

from dpbench.utils.start_folder import drop_start_folder

drop_start_folder()

from dpbench.audit.mia.cli import main  # noqa: E402 - after the start folder is dropped

main()

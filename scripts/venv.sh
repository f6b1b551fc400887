# Sourced (not run) by the scripts that run Python: main.sh, test.sh, tests/cli/run.sh.
# use_venv puts the project's virtual environment .venv/ (made by scripts/setup.sh, with the
# pinned packages of requirements.txt) first on PATH, so that `python3` in the script, and in
# the masskv CLI's plot and llama.cpp calls, is the venv's and never the system's.
masskv_venv="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv"

# use_venv WHO: WHO names the caller in the error when there is no venv yet.
use_venv() {
  if [[ ! -x "$masskv_venv/bin/python3" ]]; then
    echo "$1: no Python virtual environment at $masskv_venv: run scripts/setup.sh first" >&2
    return 1
  fi
  export VIRTUAL_ENV="$masskv_venv"
  export PATH="$masskv_venv/bin:$PATH"
  unset PYTHONHOME
}

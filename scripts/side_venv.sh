# Sourced by the scripts that make a side environment (packages whose pins clash with the project's): a uv venv
# holding exactly PACKAGES, remade when the list changes (the stamp file names what is installed).
#   side_venv VENV STAMP_NAME "PACKAGES" [HOOK]   # HOOK VENV runs after the install (extra, differently pinned steps)
# Prints the venv's python. `uv venv` writes a .gitignore into the venv, so git leaves it alone.
side_venv() {
  local venv=$1 stamp="$1/$2" packages=$3 hook=${4:-}
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$packages" ]; then
    command -v uv >/dev/null || export PATH="$HOME/.local/bin:$PATH"
    command -v uv >/dev/null || python3 -m pip install -q --user "uv==0.13.9"
    [ -x "$venv/bin/python" ] || uv venv -q -p 3.11 "$venv" >&2
    # shellcheck disable=SC2086  # one word per requirement
    uv pip install -q -p "$venv/bin/python" $packages >&2
    if [ -n "$hook" ]; then "$hook" "$venv"; fi
    echo "$packages" >"$stamp"
  fi
  echo "$(cd "$venv" && pwd)/bin/python"
}

#!/usr/bin/env bash
# Lists the project's shell files for shellcheck: tracked or new (not
# ignored) files that end in .sh/.bash or start with a sh/bash shebang.
# .bats files are left out (bats syntax is not plain bash).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
git ls-files -co --exclude-standard | while IFS= read -r file; do
  [[ -f "$file" ]] || continue
  case "$file" in
    *.bats) continue ;;
    *.sh | *.bash) echo "$file" ;;
    *) head -c 100 "$file" | grep -qE '^#!.*\b(ba)?sh\b' && echo "$file" ;;
  esac
done

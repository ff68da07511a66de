#!/usr/bin/env bash
# The README's runnable examples and the install steps they follow (no GPU): the transformers
# example's block (marked `<!-- readme-example: transformers`) is found, is valid Python, imports the
# integration and asks for experts_implementation="caracal" (scripts/test-fresh-install.sh runs it
# as written on a GPU); a missing marker is refused naming it; install-deps.sh refuses an unknown
# argument naming what it takes; test-fresh-install.sh refuses an unknown extra.
source "$(dirname "$0")/script_test_lib.sh"
extract="$root/scripts/lib/readme_example.py"

run_and_expect "missing marker" 2 "readme_example: README.md has no '<!-- readme-example: nope ...' marker" "" \
  python3 "$extract" nope
example=$(python3 "$extract" transformers) || fail "transformers example: exit $?"
python3 -c 'import ast, sys; ast.parse(sys.stdin.read())' <<<"$example" || fail "transformers example: not valid Python"
grep -q '^import caracal.integrations.transformers' <<<"$example" || fail "transformers example: does not import the integration"
grep -q 'experts_implementation="caracal"' <<<"$example" || fail "transformers example: no experts_implementation=\"caracal\""
grep -q 'backward()' <<<"$example" || fail "transformers example: does not train"

# A block with no closing fence, from text given directly.
python3 - "$extract" <<'PY' || fail "unterminated block: not refused"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("readme_example", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
try:
    mod.readme_example("x", "<!-- readme-example: x -->\n```python\nprint(1)\n")
except LookupError as e:
    assert "no fenced code block after" in str(e), e
else:
    raise SystemExit("no error")
assert mod.readme_example("x", "<!-- readme-example: x -->\ntext\n```python\nprint(1)\n```\n") == "print(1)\n"
PY

run_and_expect "install-deps bad argument" 2 "install-deps: unknown argument '--bogus' (expected nothing or --python)" "" \
  bash "$root/scripts/install-deps.sh" --bogus
run_and_expect "fresh install bad extra" 2 "test-fresh-install: CARACAL_FRESH_EXTRAS must be empty or 'transformers', got 'torchao'" "" \
  env CARACAL_FRESH_EXTRAS=torchao bash "$root/scripts/test-fresh-install.sh" "$work/fresh"
finish readme_examples

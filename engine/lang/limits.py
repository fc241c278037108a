"""The bounds on the work one rules file can cause; each is reported with its own diagnostic code (R7xx)."""

MAX_FILE_BYTES = 1 << 20          # R705: a rules file larger than 1 MiB is not parsed
MAX_TOKENS = 50_000               # R705: tokens in one file (the parser's time grows with them)
MAX_BRACKETS = 100                # R703: brackets open at once
MAX_PARSE_DEPTH = 200             # R703: levels of the parse tree (brackets, operators, calls inside each other)
MAX_EXPR_DEPTH = 64               # R703: levels of one guard, replacement or pattern (`x + 1 + 1 + ...` counts each `+`)
MAX_NUMBER_CHARS = 100            # R704: characters of one number literal
MAX_STRING_CHARS = 10_000         # R704: characters of one string literal
MAX_VARIANTS = 256                # R701: source orders one pattern expands to (2 per commutative two-source node, multiplied)
MAX_INCLUDE_DEPTH = 32            # R702: rule sets included inside each other
SHADOW_CANDIDATES = 64            # R505 compares a rule with at most this many earlier rules that could shadow it
EXAMPLE_TIME_S = 5.0              # R706: wall-clock seconds for one example (RULEC_EXAMPLE_TIMEOUT overrides)
EXAMPLE_MEMORY_BYTES = 1 << 30    # R707: memory one example may allocate, over what the checker already uses
MAX_IF_DEPTH = 40                 # generated matchers nest at most this many `if`s; deeper tests are joined with `and`
EXAMPLE_FILE_TIME_S = 60.0        # R708: wall-clock seconds for all the examples of one file (RULEC_EXAMPLE_FILE_TIMEOUT)
# at run time, in every rule's guard and replacement (RuleRuntimeError naming the rule; engine/lang/runtime.py)
RULE_TIME_S = 10.0                # seconds one guard or replacement may run on one node (RULEC_RULE_TIMEOUT overrides)
MAX_INT_BITS = 1 << 16            # bits of an int that `**`, `<<` or `*` may make
MAX_ITEMS = 1 << 20               # items of a range, or of a sequence made by `*`

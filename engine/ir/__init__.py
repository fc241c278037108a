"""The IR every layer above shares: dtypes, the op table, scalar ALU semantics, `UOp`, graph rewriting, the
index facts renderers and rules both read, and the `Kernel` a device runs."""

"""keeper-middleware: keeps long-running agents working far past their context window."""

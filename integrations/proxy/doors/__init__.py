"""The Responses and Messages front doors: their routes, answers, event streams and errors."""

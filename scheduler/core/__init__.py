"""Protocol: key names, the argument/reply codec, models, errors, the backoff policy, script loading
and the one script driver. Nothing above this layer formats a key or parses a reply."""

"""Code that runs inside a sandbox. The host reads it as text and never imports it."""

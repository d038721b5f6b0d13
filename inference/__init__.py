"""Model code with no Django in it: tier settings and their rules (`settings`), policy loading
(`policy`), the one decoder (`decoding.decode`, with precision and speculation; its parts in
`generation`) and the model judge (`judge`). It imports no other part of Flywheel; `settings` and
`judge` import no torch, so the web process validates tiers and builds judges without it."""

"""Model code with no Django in it: tier settings and their rules (`settings`), policy loading
(`policy`), batched generation (`generation`), a tier's decoding with precision and speculation
(`decoding`) and the model judge (`judge`). It imports no other part of Flywheel; `settings` and
`judge` import no torch, so the web process validates tiers and builds judges without it."""

"""Where photos come from: the hot folder (:mod:`.folder`) and cameras (:mod:`.camera`)."""

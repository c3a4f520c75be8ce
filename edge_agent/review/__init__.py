"""The expert's review queue: which photos to ask about first (:mod:`.rank`), and labelling one (:mod:`.queue`)."""

"""Reaching destinations: resolving once, classifying every address, dialling exactly the
checked one (directly or through a parent proxy), and relaying tunnel bytes."""

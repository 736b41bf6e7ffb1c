"""`fabricscope report`: what it shows, read from the store (data.py), its plots
(figures.py), its text parts (html_parts.py) and the page (page.py)."""

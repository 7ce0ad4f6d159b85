"""The TUI's keys: what each does and whether the footer shows it (the help and
ctrl+p list them all)."""

from textual.binding import Binding

from ppsim.tui.views import PANELS

APP_BINDINGS = [
    Binding("q", "quit", "Quit"),
    Binding("question_mark,f1", "help", "Help"),
    Binding("u,ctrl+z", "undo", "Undo"),
    Binding("ctrl+y", "redo", "Redo", show=False),
    Binding("p", "plan", "Plan"),
    Binding("P", "plan_policy", "Plan policy", show=False),
    Binding("a", "accept_plan", "Accept plan", show=False),
    Binding("x", "dismiss_plan", "Dismiss plan", show=False),
    Binding("z", "maximise", "Max timeline", show=False),
    Binding("e", "export", "Export", show=False),  # the help and ctrl+p list these
    Binding("y", "copy_export", "Copy", show=False),
    Binding("s", "save", "Save", show=False),
    Binding("t", "load_trace", "Trace", show=False),
    Binding("b", "pin", "Pin", show=False),
    Binding("B", "pin_typed", "Pin typed", show=False),
    Binding("v", "toggle_pinned", "Overlay", show=False),
    Binding("C", "toggle_collectives", "Collectives", show=False),
    Binding("slash", "find", "Find"),
    Binding("n", "find_next", "Next match", show=False),
    Binding("escape", "escape", "Cancel", show=False),
    Binding("c", "edit_count", "Count", show=False),
    *(Binding(str(i + 1), f"panel({i})", f"Panel {i + 1}", show=False)
      for i in range(len(PANELS))),
]
"""The application's keys; the panels' keys are their own (ppsim.tui.views)."""

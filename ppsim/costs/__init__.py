"""What each layer costs: architecture, op lists, analytic and measured costs."""

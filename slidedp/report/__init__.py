"""Run directories, plots and one-page summaries for simulated and (later) measured steps."""

"""What a Relay's agents are made of: its tools, specialists, skills and final-answer check."""

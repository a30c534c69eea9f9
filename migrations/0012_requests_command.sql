-- The command an execute permission runs, whole, apart from its title:
-- surfaces cut titles (Slack and the console at 300 characters), and a
-- command padded past the cut hid its end there.
ALTER TABLE requests ADD COLUMN command TEXT;

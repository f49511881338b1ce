# frozen_string_literal: true

# Filling and draining a pipe's or a socket's buffer, for tests that need a writer to wait.
module IOHelpers
  # Writes to +io+ until the kernel's buffer is full.
  def fill(io)
    loop { break if io.write_nonblock("x" * 65_536, exception: false) == :wait_writable }
  end

  # Reads what +io+ has until it stays empty for 50 ms (or ends).
  def drain(io)
    io.read_nonblock(1 << 20) while io.wait_readable(0.05)
  rescue IO::WaitReadable, EOFError
    nil
  end
end

# frozen_string_literal: true

require "socket"
require "timeout"
require "rbconfig"
require "tmpdir"
require "fileutils"

# One random concurrent program of the stress tester, made from a seed: a handful of ingredients
# (byte streams, timeouts, closes, queues, locks, threads, child processes, forks...), each with
# random sizes and methods and an outcome known before it runs, all running at once in one Evt.run.
# #run returns what went wrong (empty when every ingredient got what it expected).
module Stress
  # A failure: the ingredient, what it expected, what it got.
  Failure = Struct.new(:ingredient, :message) do
    def to_s = "#{ingredient}: #{message}"
  end

  # The title a forked child of #fork_child takes first thing (Process.setproctitle).
  CHILD_TITLE = "evt stress: forked child"

  # Why `pid`, a child forked by #fork_child, is stuck in Ruby's fork rather than in anything of
  # evt's, or nil. On Ruby 3.4, fork's child takes, for each other thread of the parent, that
  # thread's interrupt_lock (thread_cleanup_func, to free its interrupt_exec tasks), which the thread
  # may have held at the fork: a thread going in or out of a blocking call takes it. The child then
  # waits for it forever, with one thread, in a futex wait, before any Ruby code of its own runs.
  # Ruby 4.0 initializes those locks in the child first; Ruby 3.3 does not take them;
  # test/stress/ruby_fork_hang.rb shows it without evt. Such a child never took its title.
  # @return [String, nil]
  def self.stuck_in_rubys_fork(pid)
    return nil unless RUBY_VERSION.start_with?("3.4.") && File.directory?("/proc/#{pid}")

    title = File.binread("/proc/#{pid}/cmdline")
    wchan = File.binread("/proc/#{pid}/wchan")
    threads = Dir["/proc/#{pid}/task/*"].size
    return nil unless rubys_fork_hang?(title, wchan, threads)

    "the forked child #{pid} is stuck in Ruby's fork (one thread, kernel wait #{wchan}, no Ruby code " \
      "run): Ruby 3.4's bug, killed"
  rescue SystemCallError
    nil # ended meanwhile
  end

  # Whether a child with this command line, kernel wait and thread count shows Ruby's fork hang.
  def self.rubys_fork_hang?(title, wchan, threads)
    threads == 1 && wchan.start_with?("futex") && !title.start_with?(CHILD_TITLE)
  end

  class Program
    # Seconds a forked child has to answer before #fork_child looks at why it has not.
    FORK_PATIENCE = 10

    # Every ingredient, by name; each makes its fibers and returns a check to make after the loop.
    INGREDIENTS = %i[
      pipe_stream unix_stream tcp_stream timeout_fires timeout_spares io_timeout wait_readable_limit
      close_from_fiber close_from_thread io_select queue sized_queue queue_pop_timeout mutex condition
      thread_feeds_fibers fibers_feed_thread child_process nested_fibers many_fibers fork_child
      close_when_ready finalizer_work raise_into_wait kill_in_wait queue_close closed_reader popen_block
      timeout_races
    ].freeze

    # The ingredients that fork (not where a program forbids it: EVT_STRESS_FORK=0).
    FORKING = %i[fork_child].freeze

    attr_reader :seed, :ingredients

    # @param seed [Integer]
    # @param forks [Boolean] whether fork_child may be drawn
    # @param only [Array<Symbol>, nil] the ingredients to draw from (nil: all)
    def initialize(seed, forks: true, only: nil)
      @seed = seed
      @random = Random.new(seed)
      pool = forks && Process.respond_to?(:fork) ? INGREDIENTS : INGREDIENTS - FORKING
      pool &= only if only
      raise ArgumentError, "no ingredient to draw from (known: #{INGREDIENTS.join(", ")})" if pool.empty?
      @ingredients = Array.new(@random.rand(3..8)) { pool.sample(random: @random) }
      @failures = []
      @ruby_issues = []
    end

    # What went wrong in Ruby itself, not in evt (a forked child stuck in Ruby's fork): each noted
    # with what showed it, and not a failure.
    # @return [Array<String>]
    attr_reader :ruby_issues

    # Runs the program under Evt.run. @return [Array<Failure>]
    def run
      checks = []
      Evt.run do
        @ingredients.each_with_index do |name, index|
          checks << [name, index, send(name, Random.new(@random.rand(1 << 30)))]
        end
      end
      checks.each do |name, index, check|
        result = check.call
        @failures << Failure.new("#{name}##{index}", result) unless result == true
      end
      @failures
    end

    def to_s = "seed #{@seed}: #{@ingredients.join(", ")}"

    private

    # Calls the block in a new fiber, noting an unexpected exception as the ingredient's failure.
    def task(name)
      Fiber.schedule do
        yield
      rescue Exception => e # rubocop:disable Lint/RescueException: whatever escapes is the finding
        @failures << Failure.new(name, "#{e.class}: #{e.message} at #{e.backtrace&.first(3)&.join(" < ")}")
      end
    end

    # Bytes of a random size with newlines now and then (for gets).
    def payload(random, max)
      size = random.rand(1..max)
      bytes = random.bytes(size).tr("\n", "x")
      (size / 50).times { bytes[random.rand(size)] = "\n" }
      bytes
    end

    def write_all(random, io, data)
      offset = 0
      while offset < data.bytesize
        piece = data.byteslice(offset, random.rand(1..[data.bytesize - offset, 70_000].min))
        case random.rand(4)
        when 0 then io.write(piece)
        when 1 then io.syswrite(piece).then { |n| piece = piece.byteslice(0, n) }
        when 2
          begin
            written = io.write_nonblock(piece, exception: false)
            if written == :wait_writable
              io.wait_writable
              next
            end
            piece = piece.byteslice(0, written)
          end
        else
          half = piece.bytesize / 2
          io.write(piece.byteslice(0, half), piece.byteslice(half..))
        end
        offset += piece.bytesize
      end
      io.is_a?(BasicSocket) ? io.close_write : io.close # the reader meets the end of the stream
    end

    # Reads until `expected_size` bytes or the end: with sysread alone, or (as sysread may not
    # follow a buffered read) with the buffered methods mixed.
    def read_all(random, io, expected_size)
      got = +"".b
      unbuffered = random.rand(6) == 0
      while got.bytesize < expected_size
        left = expected_size - got.bytesize
        case unbuffered ? 4 : [0, 1, 2, 3, 5].sample(random: random)
        when 0 then got << (io.read(random.rand(1..left)) or break)
        when 1 then got << io.readpartial(random.rand(1..65_536))
        when 2
          chunk = io.read_nonblock(random.rand(1..65_536), exception: false)
          if chunk == :wait_readable
            io.wait_readable
          elsif chunk.nil?
            break
          else
            got << chunk
          end
        when 3 then got << (io.gets || break).b
        when 5 then got << (io.read || "").b
        when 4 then got << io.sysread(random.rand(1..65_536))
        end
      end
      got
    rescue EOFError
      got
    end

    # A byte stream from one fiber to another through `pair`, random writes and reads.
    def stream(random, name, reader, writer)
      data = payload(random, random.rand(2) == 0 ? 300 : 600_000).b
      got = nil
      task(name) { write_all(random, writer, data) }
      task(name) { got = read_all(random, reader, data.bytesize) }
      -> { got == data || "#{data.bytesize} bytes sent, #{got&.bytesize.inspect} received#{got && got != data ? " (different)" : ""}" }
    end

    def pipe_stream(random)
      reader, writer = IO.pipe
      check = stream(random, :pipe_stream, reader, writer)
      -> { check.call.tap { reader.close unless reader.closed? } }
    end

    def unix_stream(random)
      left, right = UNIXSocket.pair
      check = stream(random, :unix_stream, right, left)
      -> { check.call.tap { [left, right].each { |s| s.close unless s.closed? } } }
    end

    def tcp_stream(random)
      server = TCPServer.new("127.0.0.1", 0)
      client = TCPSocket.new("127.0.0.1", server.local_address.ip_port)
      accepted = server.accept
      server.close
      check = stream(random, :tcp_stream, accepted, client)
      -> { check.call.tap { [client, accepted].each { |s| s.close unless s.closed? } } }
    end

    def timeout_fires(random)
      outcome = nil
      task(:timeout_fires) do
        Timeout.timeout(random.rand(0.001..0.02)) { sleep 5 }
        outcome = :finished
      rescue Timeout::Error
        outcome = :timed_out
      end
      -> { outcome == :timed_out || outcome.inspect }
    end

    def timeout_spares(random)
      outcome = nil
      task(:timeout_spares) { outcome = Timeout.timeout(30) { sleep random.rand(0.0..0.01); :finished } }
      -> { outcome == :finished || outcome.inspect }
    end

    def io_timeout(random)
      reader, writer = IO.pipe
      reader.timeout = random.rand(0.001..0.02)
      outcome = nil
      task(:io_timeout) do
        reader.read(1)
        outcome = :read
      rescue IO::TimeoutError
        outcome = :timed_out
      end
      -> { [reader, writer].each(&:close); outcome == :timed_out || outcome.inspect }
    end

    # IO#timeout running out about when the data comes, again and again: a read that times out has
    # taken nothing, so the bytes all arrive, in order, whatever the timeouts interleave with.
    def timeout_races(random)
      reader, writer = IO.pipe
      reader.timeout = random.rand(0.0005..0.003)
      pieces = Array.new(random.rand(5..30)) { |i| "#{i}:#{"x" * random.rand(1..200)};" }
      got = +""
      timeouts = 0
      task(:timeout_races) do
        while got.bytesize < pieces.sum(&:bytesize)
          begin
            got << reader.readpartial(4096)
          rescue IO::TimeoutError
            timeouts += 1
          end
        end
      end
      task(:timeout_races) do
        pieces.each do |piece|
          sleep random.rand(0.0..0.003)
          writer.write(piece)
        end
      end
      -> { [reader, writer].each(&:close); got == pieces.join || "#{got.bytesize} bytes of #{pieces.join.bytesize}, #{timeouts} timeouts" }
    end

    def wait_readable_limit(random)
      reader, writer = IO.pipe
      outcome = :unset
      task(:wait_readable_limit) { outcome = reader.wait_readable(random.rand(0.001..0.02)) }
      -> { [reader, writer].each(&:close); outcome.nil? || outcome.inspect }
    end

    # Fibers waiting to read an IO that another fiber closes: each raises IOError.
    def close_from_fiber(random)
      reader, writer = IO.pipe
      waiters = random.rand(1..4)
      raised = 0
      waiters.times do
        task(:close_from_fiber) do
          reader.read(1)
        rescue IOError
          raised += 1
        end
      end
      task(:close_from_fiber) { sleep random.rand(0.0..0.005); reader.close }
      -> { writer.close; raised == waiters || "#{raised} of #{waiters} waiters raised IOError" }
    end

    def close_from_thread(random)
      reader, writer = IO.pipe
      raised = nil
      task(:close_from_thread) do
        reader.read(1)
      rescue IOError
        raised = true
      end
      closer = Thread.new { sleep random.rand(0.001..0.01); reader.close }
      -> { closer.join; writer.close; raised || "the waiter was not woken with IOError" }
    end

    # A fiber's read made ready in the same turn as a fiber that closes the IO under it, before it
    # runs: the read gets its byte or IOError, and the close reaches nothing the fiber waits for next.
    def close_when_ready(random)
      trigger_r, trigger_w = IO.pipe # the closer waits here
      reader, writer = IO.pipe
      read = after = closer = nil
      reading = lambda do
        read = begin
          reader.readpartial(1)
        rescue IOError
          :closed
        end
        after = another_wait(random)
      end
      closing = -> { trigger_r.read(1) && reader.close }
      if random.rand(4) == 0 # the closer is another thread: it closes at any moment of the fiber's read
        closer = Thread.new(&closing)
        task(:close_when_ready, &reading)
      else
        [reading, closing].shuffle(random: random).each { |body| task(:close_when_ready, &body) } # the order they wait in
      end
      task(:close_when_ready) do
        sleep 0 if random.rand(2) == 0
        order = closer ? [writer, trigger_w] : [writer, trigger_w].shuffle(random: random) # (a thread closes at once)
        order.each { |io| io.write("x") } # the order events come in
      end
      lambda do
        closer&.join
        [trigger_r, trigger_w, writer].each(&:close)
        (["x", :closed].include?(read) && after == :done) || "read #{read.inspect}, then #{after.inspect}"
      end
    end

    # A wait of a random kind that ends by itself: :done.
    def another_wait(random)
      case random.rand(3)
      when 0 then sleep(random.rand(0.0..0.003))
      when 1 then Thread::Queue.new.pop(timeout: random.rand(0.0..0.003))
      else IO.pipe.then { |r, w| r.wait_readable(random.rand(0.0..0.003)).tap { r.close; w.close } }
      end
      :done
    end

    # A wait of a random kind that never ends by itself (another fiber ends it), with what it holds:
    # [the wait's name, a block that runs it, a block that cleans up after, a block the fiber that
    # ends the wait calls once it has]. The lock's holder keeps it until that last block is called
    # (a fixed time could run out first on a busy machine, and the wait end on its own), or 2 s.
    def early_ended_wait(random)
      case random.rand(5)
      when 0
        r, w = IO.pipe
        [:read, -> { r.read(1) }, -> { [r, w].each(&:close) }, -> {}]
      when 1 then [:sleep, -> { sleep 30 }, -> {}, -> {}]
      when 2 then [:pop, -> { Thread::Queue.new.pop }, -> {}, -> {}]
      when 3
        lock = Thread::Mutex.new
        release = Thread::Queue.new
        Fiber.schedule { lock.synchronize { release.pop(timeout: 2) } }
        [:lock, -> { lock.synchronize {} }, -> {}, -> { release << true }]
      else
        lock = Thread::Mutex.new
        [:condition, -> { lock.synchronize { Thread::ConditionVariable.new.wait(lock) } }, -> {}, -> {}]
      end
    end

    # Fiber#raise into a fiber in a wait: the exception comes out of that wait, and the wait leaves
    # nothing behind (the fiber's next wait ends by itself).
    def raise_into_wait(random)
      name, wait, clean, release = early_ended_wait(random)
      error = Class.new(StandardError)
      got = after = nil
      waiter = task(:raise_into_wait) do
        wait.call
        got = :returned
      rescue error
        got = :raised
        after = another_wait(random)
      end
      task(:raise_into_wait) do
        sleep random.rand(0.0..0.003)
        waiter.raise(error) if waiter.alive?
        release.call
      end
      -> { clean.call; [got, after] == %i[raised done] || "#{name}: #{got.inspect}, then #{after.inspect}" }
    end

    # Fiber#kill of a fiber in a wait: its ensure runs, and the loop goes on without it (a fiber
    # waiting on the same lock or queue after it still gets in).
    def kill_in_wait(random)
      name, wait, clean, release = early_ended_wait(random)
      ensured = false
      waiter = task(:kill_in_wait) do
        wait.call
      ensure
        ensured = true
      end
      killed = nil
      task(:kill_in_wait) do
        sleep random.rand(0.0..0.003)
        killed = waiter.alive? ? (waiter.kill && :killed) : :ended # (kill can find it already ended)
        release.call
      end
      -> { clean.call; (ensured && !waiter.alive? && killed == :killed) || "#{name}: ensure #{ensured}, #{killed.inspect}" }
    end

    # Queue#close with fibers popping, SizedQueue#close with fibers pushing into a full queue: the
    # poppers get nil, the pushers ClosedQueueError.
    def queue_close(random)
      sized = random.rand(2) == 0
      queue = sized ? Thread::SizedQueue.new(1).tap { |q| q << :full } : Thread::Queue.new
      waiters = random.rand(1..4)
      got = []
      waiters.times do
        task(:queue_close) do
          got << (sized ? queue.push(:more) : queue.pop).inspect
        rescue ClosedQueueError
          got << :closed_queue_error
        end
      end
      task(:queue_close) { sleep random.rand(0.0..0.003); queue.close }
      expected = [sized ? :closed_queue_error : "nil"] * waiters
      -> { got == expected || "#{got.inspect}, not #{expected.inspect}" }
    end

    # A writer waiting on a full pipe whose reader another fiber closes: Errno::EPIPE, as without a
    # scheduler (Ruby ignores SIGPIPE).
    def closed_reader(random)
      reader, writer = IO.pipe
      got = nil
      task(:closed_reader) do
        writer.write("x" * random.rand(70_000..300_000)) # past a pipe's 64 kB: it waits
        got = :written
      rescue Errno::EPIPE
        got = :epipe
      end
      task(:closed_reader) { sleep random.rand(0.0..0.003); reader.close }
      -> { writer.close rescue nil; got == :epipe || got.inspect } # rubocop:disable Style/RescueModifier
    end

    # Objects whose finalizers remove a file (as Tempfile's do), collected by the GCs a scheduled
    # fiber's allocations start: the finalizers run inside that fiber, wherever it is, and each does
    # its work without an error (Ruby 4.0 sends the unlink to the scheduler's blocking_operation_wait;
    # one time in two each also sleeps 0, letting the other fibers run in the middle of it).
    def finalizer_work(random)
      dir = Dir.mktmpdir("evt-stress")
      paths = Array.new(random.rand(5..40)) { |i| File.join(dir, i.to_s).tap { |path| File.write(path, "") } }
      state = { removed: [], errors: [], over: false, yields: random.rand(2) == 0 } # yields: sleep(0) in each
      ended = false
      task(:finalizer_work) do
        paths.each { |path| ObjectSpace.define_finalizer(Object.new, Program.remover(path, state)) }
        random.rand(20_000..200_000).times { |i| sleep 0 if (+"garbage #{i}").size.zero? || i % 10_000 == 0 }
        ended = true
      end
      lambda do
        state[:over] = true # the finalizers of objects not collected yet run at exit, with nothing to do
        left = state[:removed].select { |path| File.exist?(path) }
        FileUtils.rm_rf(dir)
        (ended && state[:errors].empty? && left.empty?) ||
          "ended: #{ended}, #{state[:removed].size} finalizers done, #{left.size} of their files left, " \
          "errors: #{state[:errors].first(3).join("; ")}"
      end
    end

    # A finalizer that removes `path`, made where it holds no object to finalize.
    def self.remover(path, state)
      proc do
        next if state[:over]

        File.unlink(path)
        sleep(0) if state[:yields] # a fiber switch inside a finalizer: other fibers run meanwhile
        state[:removed] << path
      rescue Exception => e # rubocop:disable Lint/RescueException: a finalizer's error is otherwise lost
        state[:errors] << "#{e.class}: #{e.message} at #{e.backtrace&.first(3)&.join(" < ")}"
      end
    end

    def io_select(random)
      reader, writer = IO.pipe
      ready = nil
      task(:io_select) { ready = IO.select([reader], nil, nil, 30) }
      task(:io_select) { sleep random.rand(0.0..0.005); writer.write("x") }
      -> { result = ready == [[reader], [], []] || ready.inspect; [reader, writer].each(&:close); result }
    end

    def queue(random)
      queue = Thread::Queue.new
      count = random.rand(1..200)
      got = []
      task(:queue) { count.times { |i| queue << i; sleep 0 if i % 7 == 0 } }
      task(:queue) { count.times { got << queue.pop } }
      -> { got == Array.new(count) { |i| i } || "#{got.size} of #{count} in order" }
    end

    def sized_queue(random)
      queue = Thread::SizedQueue.new(random.rand(1..4))
      count = random.rand(1..100)
      got = []
      task(:sized_queue) { count.times { |i| queue.push(i) } }
      task(:sized_queue) { count.times { got << queue.pop } }
      -> { got == Array.new(count) { |i| i } || "#{got.size} of #{count} in order" }
    end

    def queue_pop_timeout(random)
      queue = Thread::Queue.new
      got = :unset
      task(:queue_pop_timeout) { got = queue.pop(timeout: random.rand(0.001..0.02)) }
      -> { got.nil? || got.inspect }
    end

    # Fibers taking a lock and waiting inside it: never two inside at once, every one gets in.
    def mutex(random)
      lock = Thread::Mutex.new
      fibers = random.rand(2..20)
      inside = 0
      most = 0
      done = 0
      fibers.times do
        task(:mutex) do
          lock.synchronize do
            inside += 1
            most = [most, inside].max
            sleep random.rand(0.0..0.002)
            inside -= 1
            done += 1
          end
        end
      end
      -> { [done, most] == [fibers, 1] || "#{done} of #{fibers} done, at most #{most} inside" }
    end

    def condition(random)
      lock = Thread::Mutex.new
      ready = Thread::ConditionVariable.new
      waiters = random.rand(1..5)
      woken = 0
      go = false
      waiters.times do
        task(:condition) { lock.synchronize { ready.wait(lock) until go; woken += 1 } }
      end
      task(:condition) { sleep random.rand(0.0..0.005); lock.synchronize { go = true; ready.broadcast } }
      -> { woken == waiters || "#{woken} of #{waiters} woken" }
    end

    def thread_feeds_fibers(random)
      queue = Thread::Queue.new
      count = random.rand(1..100)
      got = []
      feeder = Thread.new { count.times { |i| queue << i; sleep 0.0001 if i % 10 == 0 } }
      task(:thread_feeds_fibers) { count.times { got << queue.pop } }
      -> { feeder.join; got == Array.new(count) { |i| i } || "#{got.size} of #{count} in order" }
    end

    def fibers_feed_thread(random)
      queue = Thread::Queue.new
      count = random.rand(1..100)
      total = nil
      consumer = Thread.new { sum = 0; count.times { sum += queue.pop }; sum }
      task(:fibers_feed_thread) { count.times { |i| queue << i; sleep 0 if i % 9 == 0 } }
      task(:fibers_feed_thread) { total = consumer.value }
      -> { total == count * (count - 1) / 2 || "the thread summed #{total.inspect}" }
    end

    def child_process(random)
      code = random.rand(0..100)
      status = nil
      task(:child_process) do
        pid = Process.spawn(RbConfig.ruby, "--disable-gems", "-e", "exit #{code}")
        _, status = Process.wait2(pid)
      end
      -> { status&.exitstatus == code || "exit status #{status.inspect}, not #{code}" }
    end

    # IO.popen's block form, a fiber reading the child's output while the block ends at a random
    # moment: the reader gets the whole output or IOError (the block's end closes the IO), and the
    # child's status is the code it exits with.
    def popen_block(random)
      code = random.rand(0..100)
      delay = random.rand(0.0..0.02)
      got = status = nil
      task(:popen_block) do
        IO.popen([RbConfig.ruby, "--disable-gems", "-e", "sleep #{delay}; print :out; exit #{code}"]) do |io|
          Fiber.schedule do
            got = io.read
          rescue IOError
            got = :closed
          end
          sleep random.rand(0.0..0.03)
        end
        status = $?
      end
      -> { (["out", :closed].include?(got) && status&.exitstatus == code) || "read #{got.inspect}, status #{status.inspect}" }
    end

    # Fibers that schedule fibers that schedule fibers.
    def nested_fibers(random)
      depth = random.rand(1..4)
      width = random.rand(1..3)
      ended = 0
      grow = lambda do |level|
        task(:nested_fibers) do
          width.times { grow.call(level + 1) } if level < depth
          sleep 0 if random.rand(2) == 0
          ended += 1
        end
      end
      grow.call(1)
      expected = (1..depth).sum { |level| width**(level - 1) }
      -> { ended == expected || "#{ended} of #{expected} fibers ended" }
    end

    def many_fibers(random)
      count = random.rand(100..600)
      ended = 0
      count.times { task(:many_fibers) { sleep(random.rand(2) == 0 ? 0 : 0.001); ended += 1 } }
      -> { ended == count || "#{ended} of #{count} fibers ended" }
    end

    # A fork from a fiber: the child answers through a pipe and exits with a code of its own. A
    # child that has not answered after FORK_PATIENCE seconds, and is stuck in Ruby's own fork
    # (Stress.stuck_in_rubys_fork), is killed and noted as Ruby's (#ruby_issues), not as a failure.
    def fork_child(random)
      code = random.rand(1..100)
      reader, writer = IO.pipe
      answer = status = rubys = nil
      task(:fork_child) do
        pid = fork do
          Process.setproctitle(CHILD_TITLE) # first: from here on the child is past Ruby's fork
          reader.close
          writer.write("child #{code}")
          writer.close
          exit!(code)
        end
        writer.close
        until rubys || reader.wait_readable(FORK_PATIENCE)
          next unless (rubys = Stress.stuck_in_rubys_fork(pid))

          Process.kill(:KILL, pid)
          @ruby_issues << "fork_child: #{rubys}"
        end
        answer = reader.read unless rubys
        _, status = Process.wait2(pid)
      end
      lambda do
        reader.close
        next true if rubys # noted as Ruby's, not a failure

        [answer, status&.exitstatus] == ["child #{code}", code] || [answer, status].inspect
      end
    end
  end
end

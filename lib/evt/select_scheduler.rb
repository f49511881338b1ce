# frozen_string_literal: true

module Evt
  # A Fiber Scheduler on the pure-Ruby loop ({SelectLoop}), a sibling of {Scheduler}: the same hooks
  # written in Ruby ({Scheduling}), over IO.select instead of the C loop. Made on request, or by
  # `Evt::Scheduler.new(backend: :select)` where the extension has no select backend of its own.
  # Where the extension is not loaded, {Scheduler} runs on this loop too. It takes the same
  # options as {Scheduler}, `backend:` being :select or nil.
  #
  # @example The pure-Ruby loop, on request
  #   Fiber.set_scheduler(Evt::SelectScheduler.new(pool_size: 0))
  class SelectScheduler < SelectLoop
    prepend Scheduling
    extend Choosing

    # A scheduler on a pure-Ruby loop of its own, for the current thread.
    # @overload initialize(backend: :select, pool_size: nil)
    #   @param backend [Symbol, String, nil] :select (the only one this class runs) or nil
    #   @param pool_size [Integer, nil] as for {Scheduler#initialize}
    #   @raise [ArgumentError] any other backend
    def initialize(backend: :select)
      name = self.class.send(:choose_backend, backend || :select)
      raise ArgumentError, "evt: #{self.class} runs the select backend only, not #{name.inspect}" unless name == :select

      super(name)
    end
  end
end
